"""What the CPU and GPU rules share (both rule fingerprints cover this folder)."""
