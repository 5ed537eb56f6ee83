"""The webhook-delivery process (``python -m services.webhook_delivery``)."""
