"""The web edge's machinery."""
