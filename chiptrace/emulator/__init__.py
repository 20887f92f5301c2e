"""The emulated rack: a discrete-event model of six chip types and their links."""
