"""FedMF from securefed as a Flower app (see app.py)."""
