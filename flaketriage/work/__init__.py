"""Work: the task messages the service hands its workers, recording and sending them, and the one
Celery configuration both sides build their app from."""
