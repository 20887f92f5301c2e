"""Viewer widgets: one per module."""
