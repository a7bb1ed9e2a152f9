"""FastAPI dependencies of the edge."""
from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from edge.config import EdgeSettings
from edge.round_loop import EdgeRoundLoop
from edge.tasks import TaskBoard
from shared.web import bearer_guard


def _settings(request: Request) -> EdgeSettings:
    return request.app.state.settings


def _board(request: Request) -> TaskBoard:
    return request.app.state.board


def _loop(request: Request) -> EdgeRoundLoop:
    return request.app.state.round_loop


SettingsDep = Annotated[EdgeSettings, Depends(_settings)]
BoardDep = Annotated[TaskBoard, Depends(_board)]
RoundLoopDep = Annotated[EdgeRoundLoop, Depends(_loop)]

require_client = Depends(bearer_guard(lambda r: r.app.state.settings.client_token))
