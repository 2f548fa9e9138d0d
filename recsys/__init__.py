"""Reference recommenders built on securefed: FedMF family (fedmf), data sets (data)."""
