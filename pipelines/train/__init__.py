"""Training of draft artefacts on the target's own generations (e.g. ReDrafter heads)."""
