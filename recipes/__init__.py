"""How the models this project ships are built (not imported by the library)."""
