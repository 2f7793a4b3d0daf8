"""The steps of the pipeline, one file each: validate → batch → cache → embed → sink → commit."""
