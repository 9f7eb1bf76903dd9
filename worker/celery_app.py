"""`celery -A worker.celery_app` keeps working: the Celery app lives in worker/tasks/app.py."""

from .tasks.app import app

__all__ = ["app"]
