"""The Textual viewer (installed as chiptrace.viewer)."""
