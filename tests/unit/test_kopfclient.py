"""kopf's login answer: the connection's server and credentials over a bounded pool."""

from __future__ import annotations

import asyncio

import kopf
import pytest

from sandlot.adapters.kopfclient import KOPF_CONNECTIONS, kopf_session

CONNECTION = {
    "server": "https://127.0.0.1:6443",
    "insecure": True,
    "scheme": "Bearer",
    "token": "t0ken",
}


def test_the_session_carries_the_connection_and_a_bounded_pool() -> None:
    async def login() -> tuple[str, int, str | None]:
        answer = kopf_session(CONNECTION)
        assert isinstance(answer, kopf.AiohttpSession)
        session = answer.aiohttp_session
        try:
            assert session.connector is not None
            return answer.server, session.connector.limit, session.headers.get("Authorization")
        finally:
            await session.close()

    server, limit, auth = asyncio.run(login())
    assert server == "https://127.0.0.1:6443"
    assert limit == KOPF_CONNECTIONS
    assert auth == "Bearer t0ken"


def test_a_limit_below_one_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="connection limit must be at least 1, got 0"):
        kopf_session(CONNECTION, limit=0)
