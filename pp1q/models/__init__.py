"""Draft and target models behind one seam; the embedded seeded toy pair (toy.py)."""
