"""Thin Tornado handlers: parse with a schema, call the protocol layer, render."""
