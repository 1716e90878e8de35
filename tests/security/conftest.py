"""The adversarial suite runs against real deployments (embedded and distributed) over mutual TLS, with the
same fixtures as the integration tests."""

from tests.integration.conftest import pki_home, running  # noqa: F401 - pytest fixtures
