"""The saved loader state: its format and its one reader (``format``), the state file
(``file``), the fingerprint a state must match (``fingerprint``), what a state says was
delivered (``report``), a state carried over to a changed mix (``remix``), checkpoint
folders on any filesystem (``checkpoint``, their layout ``checkpointsave``) and
``torch.distributed.checkpoint`` loading (``dcp_plan``, ``dcp_read``). A saved chain is
walked in one place, ``fmsdata.stages.savedchain``.
"""
