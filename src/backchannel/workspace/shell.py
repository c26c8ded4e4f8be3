"""A local sandbox backend: the disk backend plus ``execute``, shell commands run in its root.

Commands run with the root as their working directory, for at most
``timeout`` seconds (the whole process group is killed then), and their
combined output is cut at ``max_output_bytes``. The root confines the file
tools, not the shell: a command can reach whatever the user running it can,
which is why ``create_deep_agent`` asks a human to approve each ``execute``
unless told otherwise (``interrupt_on={"execute": False}``).
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Mapping

from backchannel.workspace.disk import FilesystemBackend
from backchannel.workspace.protocol import ExecuteResponse

__all__ = ["LocalShellBackend"]

DEFAULT_EXECUTE_TIMEOUT = 120


class LocalShellBackend(FilesystemBackend):
    """Files in ``root_dir`` and a shell that runs there (``execute``)."""

    def __init__(self, root_dir: str | os.PathLike[str] | None = None, *, virtual_mode: bool = True,
                 timeout: int = DEFAULT_EXECUTE_TIMEOUT, max_output_bytes: int = 100_000,
                 env: Mapping[str, str] | None = None, inherit_env: bool = False) -> None:
        super().__init__(root_dir, virtual_mode=virtual_mode)
        if timeout <= 0:
            raise ValueError(f"timeout must be positive, got {timeout}")
        self.timeout = timeout
        self.max_output_bytes = max_output_bytes
        base = dict(os.environ) if inherit_env else {"PATH": os.environ.get("PATH", os.defpath)}
        self.env = {**base, **(env or {})}

    async def execute(self, command: str, *, timeout: int | None = None) -> ExecuteResponse:
        """Run ``command`` in the root; its output (stdout and stderr together) and exit code."""
        if timeout is not None and timeout <= 0:
            return ExecuteResponse(f"Error: timeout must be positive, got {timeout}", exit_code=None)
        limit = timeout or self.timeout
        process = await asyncio.create_subprocess_shell(
            command, cwd=self.cwd, env=self.env, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, start_new_session=True)
        assert process.stdout is not None
        chunks: list[bytes] = []
        size = 0
        truncated = False
        try:
            async with asyncio.timeout(limit):
                while chunk := await process.stdout.read(65536):
                    if size < self.max_output_bytes:
                        chunks.append(chunk[:self.max_output_bytes - size])
                    size += len(chunk)
                    truncated = truncated or size > self.max_output_bytes
                await process.wait()
        except TimeoutError:
            _kill(process)
            await process.wait()
            output = b"".join(chunks).decode("utf-8", "replace")
            return ExecuteResponse(f"{output}\nError: Command timed out after {limit} seconds", exit_code=124,
                                   truncated=truncated)
        except BaseException:
            _kill(process)  # cancelled with the run: don't leave the command running
            raise
        return ExecuteResponse(b"".join(chunks).decode("utf-8", "replace"), exit_code=process.returncode,
                               truncated=truncated)


def _kill(process: asyncio.subprocess.Process) -> None:
    """Kill the command and everything it started (its own process group)."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
