"""What runs during a training job: the job runner (:mod:`.train`), building and fitting a run, config
composition, instantiation, the process of a script run (settings, stops, console output), the allocator setting
and the OmegaConf resolvers every run registers before Hydra composes.
"""
