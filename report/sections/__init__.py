"""The report's sections, one module each: a claim's own section (``claim_v_section``,
``claim_j_section``, ``claim_e_section``, ``claim_r_section``), each a
``context(results, index, spec)`` function named by its :class:`~claims.registry.ClaimSpec`
(``report_context``) beside a Jinja partial (``template``); :mod:`.generic_section`, the section of
a claim without them; and the run's own sections: :mod:`.controls_section`,
:mod:`.opt_in_sections`, :mod:`.gate_section`, :mod:`.thresholds_section` and
:mod:`.provenance_section`.
"""
