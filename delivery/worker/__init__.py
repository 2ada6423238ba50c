"""The delivery worker process. `RQ_WORKER_CLASS` names `delivery.worker.DeliveryWorker`."""

from delivery.worker.rq_worker import DeliveryWorker

__all__ = ["DeliveryWorker"]
