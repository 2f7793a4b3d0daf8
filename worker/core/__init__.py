"""The streaming core: the poll loop, assignment and pausing, the pipeline of stage threads, the
offsets and the fence, the records a batch holds, and the one place that assembles the chain
(``chain``) and the worker around it (``runner``)."""
