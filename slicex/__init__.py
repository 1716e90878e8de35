"""slicex shared kernel: what every actor needs (URNs, errors, clock, terms, certificates, credentials, store)."""

__version__ = "0.1.0"
