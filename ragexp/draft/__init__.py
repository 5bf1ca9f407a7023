"""Drafting an evaluation set from a team's documents: cases a model writes and people screen."""
