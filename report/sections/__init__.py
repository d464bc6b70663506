"""The report's claim sections: one module per claim with a section of its own (``claim_v``,
``claim_j``, ``claim_e``), each a ``context(results, index, spec)`` function named by its
:class:`~claims.registry.ClaimSpec` (``report_context``) beside a Jinja partial (``template``), and
:mod:`.generic`, the section of a claim without them.
"""
