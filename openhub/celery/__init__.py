"""The broker side: the Celery adapter and openhub's kombu transports."""
