"""Configuration: the gateway's YAML file, validated, and the one formatter of its problems.

``settings`` is the frozen root model of ``gateway.yaml`` (its sections live with the features
that read them, on the shared base of ``base``) and ``loader`` reads the file and the
environment into it; ``errors`` formats every configuration problem as
``file:line: key: problem``; ``keys_file``, ``tls_files``, ``url_paths`` and
``override_names`` check the parts of a config that name other files, paths and keys.
"""
