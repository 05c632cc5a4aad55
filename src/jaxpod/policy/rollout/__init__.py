"""jaxpod.policy.rollout: a policy's samples: problems -> the engine -> scored groups (`roller`), a problem's samples
as one-turn requests or multi-turn episodes (`episodes`), one problem's scored samples (`groups`)."""
