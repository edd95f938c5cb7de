"""The app's tabs, one module each: a pane that keeps what it shows and draws it."""
