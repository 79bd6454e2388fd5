"""The operator's work: the actions on clients, users, installations, grants, sessions and
tokens (:mod:`.actions`), their schemas, the operator's view of a running service
(:mod:`.operator`) and provisioning from a file (:mod:`.provisioning`)."""
