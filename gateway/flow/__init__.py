"""Flow control: priority classes and fair shares when the fleet is saturated.

* :mod:`gateway.flow.settings`: the ``flow_control:`` config section.
* :mod:`gateway.flow.errors`: ``FlowError`` and its codes (``queue_full``, ``queue_timeout``, ...).
* :mod:`gateway.flow.queues`: bounded per-class queues, strict priority between classes,
  deficit round robin between keys (or teams) within a class (pure logic).
* :mod:`gateway.flow.saturation`: whether a replica has room (pure logic over the scraped
  vLLM signals and the gateway's in-flight count).
* :mod:`gateway.flow.classify`: a request's class and fair-share flow (key or team, weight).
* :mod:`gateway.flow.reserve`: replicas kept free of the lower classes while the higher
  classes' load fits on them (``flow_control.reserve``; pure logic).
* :mod:`gateway.flow.peers` and :mod:`gateway.flow.fleetshare`: in-flight counts and fair
  shares across gateway processes through Redis (``flow_control.shared``).
* :mod:`gateway.flow.gate` and :mod:`gateway.flow.lane`: the thin adapter the relay calls
  (``FlowGate``, and one ``Lane`` per request).
"""

from gateway.flow.errors import (
    FlowError,
    PriorityRaiseRefused,
    QueueFull,
    QueueTimeout,
    Shed,
    UnknownPriorityClass,
)
from gateway.flow.queues import ClassQueue, ClassQueues, Waiter
from gateway.flow.saturation import has_room, with_room
from gateway.flow.settings import (
    FlowClassSettings,
    FlowControlSettings,
    FlowShare,
    SaturationSettings,
)

__all__ = [
    "ClassQueue",
    "ClassQueues",
    "FlowClassSettings",
    "FlowControlSettings",
    "FlowError",
    "FlowShare",
    "PriorityRaiseRefused",
    "QueueFull",
    "QueueTimeout",
    "SaturationSettings",
    "Shed",
    "UnknownPriorityClass",
    "Waiter",
    "has_room",
    "with_room",
]
