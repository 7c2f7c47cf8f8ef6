"""Loading the model and what makes its forward fast on this machine (prepacked head, OpenMP)."""
