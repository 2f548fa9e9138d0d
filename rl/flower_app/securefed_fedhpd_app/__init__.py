"""FedHPD's Flower app (``flwr run``): the components are in :mod:`securefed_fedhpd_app.app`."""
