"""The streaming core: the poll loop of a consumer group (``loop``, its rebalance call-backs in
``rebalance``) and of a share group (``share_loop``), assignment and pausing, the pipeline of stage
threads, the offsets and the fence, the deliveries, and the records a batch holds. The chain and the
worker around it are assembled in ``worker.assembly``."""
