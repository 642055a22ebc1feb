"""Minimization: the subset reducer, the noisy oracle, and the bundle minimizer that uses them."""
