"""FedSlate's Flower app (``flwr run``): the components are in :mod:`securefed_fedslate_app.app`."""
