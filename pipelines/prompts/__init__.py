"""The knowledge prompts' templates: the shipped ones (``templates/<domain>.j2``) and a team's own, loaded,
checked and rendered sandboxed (``template``). The job config checks a named template at load."""
