"""The project's composition, on top of every app: its URL map."""
