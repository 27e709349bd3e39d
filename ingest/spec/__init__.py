"""Source specs: the spec as data and its JSON form (``model``), the TOML parsed and validated
(``parse``), the ``[table]`` section (``table``), what a new version may not change
(``evolution``) and the spec a worker holds now (``holder``).
"""
