"""The dialogs over the tabs: a form, a yes/no question, the help."""

# Its modules, each imported where it is used: importing the package loads none of them.
__all__ = ["confirm", "form", "frame", "help"]
