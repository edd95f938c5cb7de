"""The dialogs over the tabs: a form, a yes/no question, the help."""
