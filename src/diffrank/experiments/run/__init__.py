"""What runs during a training job: the job runner (:mod:`.train`), fit/test, config composition, instantiation,
the loggers, the allocator setting and the OmegaConf resolvers every run registers before Hydra composes.
"""
