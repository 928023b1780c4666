#!/usr/bin/env python3
"""Write the protobuf descriptors the gRPC endpoint serves, as one FileDescriptorSet.

The set holds the Vertex AI v1 services the server answers over gRPC (JobService,
PipelineService, VizierService, MetadataService, TensorboardService), the real
`google.longrunning.Operations` service, and every file their messages come from, each file after the files it depends on, so that
prost-reflect's `DescriptorPool::decode` and gRPC server reflection need nothing else.

Everything is taken from the installed SDK's own definitions, nothing is written by hand:

  * messages and enums: the files proto-plus registers in protobuf's default descriptor
    pool for `google.cloud.aiplatform.v1`, plus their dependencies (google/protobuf/*,
    google/rpc/*, google/api/*, google/longrunning/operations.proto);
  * services and methods: proto-plus defines no services, so they are rebuilt from the
    gRPC transports, whose stubs name each RPC's full path and its request and response
    types (the transport is built on a channel that only records those stubs);
  * HTTP rules: each method's `google.api.http` option comes from the REST transport's
    `_get_http_options()` for it, the first entry as the rule and the others as
    `additional_bindings`.

Run it again after updating google-cloud-aiplatform in the SDK venv, from the repo root:

    /tmp/ci/.venv/bin/python scripts/gen-grpc-descriptors.py [OUT]

OUT defaults to crates/server/grpc/aiplatform_v1.binpb. The output is deterministic, so
an unchanged SDK gives the same bytes.
"""

import importlib
import os
import sys

import grpc
from google.api import annotations_pb2, http_pb2
from google.protobuf import descriptor_pb2, descriptor_pool

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_OUT = os.path.join(ROOT, "crates", "server", "grpc", "aiplatform_v1.binpb")

# Each services file: its proto package, the SDK's Python package (whose
# `services.<module>.transports` hold the gRPC paths and HTTP rules), and its services:
# name -> (module, the methods kept, or None for all).
SERVICE_FILES = [
    (
        "trainyard/aiplatform_v1_services.proto",
        "google.cloud.aiplatform.v1",
        "google.cloud.aiplatform_v1",
        {
            "JobService": ("job_service", None),
            "PipelineService": ("pipeline_service", None),
            "VizierService": ("vizier_service", None),
            "MetadataService": ("metadata_service", None),
            "TensorboardService": ("tensorboard_service", None),
        },
    ),
    # The SDK asks the resource manager for the id of the project it was given (inside a
    # job, with no endpoint of its own): GetProject alone.
    (
        "trainyard/resourcemanager_v3_services.proto",
        "google.cloud.resourcemanager.v3",
        "google.cloud.resourcemanager_v3",
        {"Projects": ("projects", ["GetProject"])},
    ),
]

# Files the set always carries, besides what the services reach: the HTTP annotation,
# the long-running operations service (with its own HTTP rules) and the error details.
EXTRA_FILES = [
    "google/api/http.proto",
    "google/api/annotations.proto",
    "google/longrunning/operations.proto",
    "google/rpc/status.proto",
    "google/rpc/error_details.proto",
]

HTTP_VERBS = ("get", "put", "post", "delete", "patch")


class RecordingChannel(grpc.Channel):
    """A channel that opens no connection and records every stub a transport asks for."""

    def __init__(self):
        # path -> (client_streaming, server_streaming, serializer, deserializer)
        self.calls = {}

    def _record(self, client_streaming, server_streaming, method, request_serializer,
                response_deserializer):
        self.calls.setdefault(
            method,
            (client_streaming, server_streaming, request_serializer, response_deserializer),
        )
        return lambda *args, **kwargs: None

    def unary_unary(self, method, request_serializer=None, response_deserializer=None,
                    _registered_method=False):
        return self._record(False, False, method, request_serializer, response_deserializer)

    def unary_stream(self, method, request_serializer=None, response_deserializer=None,
                     _registered_method=False):
        return self._record(False, True, method, request_serializer, response_deserializer)

    def stream_unary(self, method, request_serializer=None, response_deserializer=None,
                     _registered_method=False):
        return self._record(True, False, method, request_serializer, response_deserializer)

    def stream_stream(self, method, request_serializer=None, response_deserializer=None,
                      _registered_method=False):
        return self._record(True, True, method, request_serializer, response_deserializer)

    def subscribe(self, callback, try_to_connect=False):
        pass

    def unsubscribe(self, callback):
        pass

    def close(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc_val, exc_tb):
        return False


def message_descriptor(fn):
    """The message descriptor behind a stub's (de)serializer.

    proto-plus types pass bound class methods (`CustomJob.deserialize`), plain protobuf
    types pass `Operation.FromString` or the unbound `SerializeToString`.
    """
    owner = getattr(fn, "__self__", None) or getattr(fn, "__objclass__", None)
    if hasattr(owner, "pb") and hasattr(owner, "meta"):
        return owner.pb().DESCRIPTOR
    if hasattr(owner, "DESCRIPTOR"):
        return owner.DESCRIPTOR
    raise SystemExit(f"cannot tell the message type of {fn!r}")


def grpc_methods(package, sdk, service, module, kept=None):
    """The service's RPCs as (name, streaming flags, request, response descriptors).

    Each RPC is a property of the gRPC transport that asks its channel for a stub. The
    transport is made without its constructor (which would set up credentials and wrap
    the channel in a logging interceptor that creates stubs only when called) and given
    a recording channel; reading every property in definition order records the stubs.
    """
    grpc_mod = importlib.import_module(f"{sdk}.services.{module}.transports.grpc")
    transport_cls = getattr(grpc_mod, f"{service}GrpcTransport")
    channel = RecordingChannel()
    transport = transport_cls.__new__(transport_cls)
    transport._stubs = {}
    transport._grpc_channel = channel
    transport._logged_channel = channel
    for name, attr in vars(transport_cls).items():
        if isinstance(attr, property):
            try:
                getattr(transport, name)
            except Exception:
                pass  # not an RPC (e.g. operations_client needs the real constructor)

    # Keep only this service's own paths, not the mixins (operations, locations, IAM).
    prefix = f"/{package}.{service}/"
    methods = []
    for path, (cstream, sstream, ser, deser) in channel.calls.items():
        if path.startswith(prefix):
            name = path[len(prefix):]
            if kept is not None and name not in kept:
                continue
            methods.append((name, cstream, sstream, message_descriptor(ser),
                            message_descriptor(deser)))
    if not methods:
        raise SystemExit(f"no methods found for {service}")
    return methods


def http_rule(sdk, service, module, method):
    """The method's `google.api.http` rule from the REST transport, or None."""
    rest_mod = importlib.import_module(f"{sdk}.services.{module}.transports.rest_base")
    base = getattr(rest_mod, f"_Base{service}RestTransport")
    holder = getattr(base, f"_Base{method}", None)
    if holder is None or not hasattr(holder, "_get_http_options"):
        return None
    options = holder._get_http_options()
    if not options:
        return None

    def to_rule(option):
        rule = http_pb2.HttpRule()
        verb = option["method"].lower()
        if verb in HTTP_VERBS:
            setattr(rule, verb, option["uri"])
        else:
            rule.custom.kind = verb.upper()
            rule.custom.path = option["uri"]
        if option.get("body"):
            rule.body = option["body"]
        return rule

    rule = to_rule(options[0])
    for extra in options[1:]:
        rule.additional_bindings.append(to_rule(extra))
    return rule


def build_services_file(file_name, package, sdk, services):
    """An extra file declaring services, with the files their messages live in."""
    fdp = descriptor_pb2.FileDescriptorProto(
        name=file_name, package=package, syntax="proto3"
    )
    deps = {"google/api/annotations.proto"}
    missing_rules = []
    method_count = 0
    for service, (module, kept) in services.items():
        sdp = fdp.service.add(name=service)
        for name, cstream, sstream, request, response in grpc_methods(package, sdk, service, module, kept):
            mdp = sdp.method.add(
                name=name,
                input_type=f".{request.full_name}",
                output_type=f".{response.full_name}",
            )
            if cstream:
                mdp.client_streaming = True
            if sstream:
                mdp.server_streaming = True
            deps.add(request.file.name)
            deps.add(response.file.name)
            rule = http_rule(sdk, service, module, name)
            if rule is None:
                missing_rules.append(f"{service}.{name}")
            else:
                mdp.options.Extensions[annotations_pb2.http].CopyFrom(rule)
            method_count += 1
    fdp.dependency.extend(sorted(deps))
    return fdp, method_count, missing_rules


def sort_dependencies(fdp):
    """Sort a file's imports by name, keeping public and weak ones pointing right.

    proto-plus collects a file's imports in a set, so their order changes from one run
    to the next; sorting them makes the output reproducible and changes nothing else.
    """
    deps = list(fdp.dependency)
    public = {deps[i] for i in fdp.public_dependency}
    weak = {deps[i] for i in fdp.weak_dependency}
    deps.sort()
    del fdp.dependency[:]
    fdp.dependency.extend(deps)
    del fdp.public_dependency[:]
    fdp.public_dependency.extend(i for i, d in enumerate(deps) if d in public)
    del fdp.weak_dependency[:]
    fdp.weak_dependency.extend(i for i, d in enumerate(deps) if d in weak)


def ordered_files(pool, roots):
    """The root files and all they import, each after its dependencies, in a fixed order."""
    seen = set()
    out = []

    def visit(fd):
        if fd.name in seen:
            return
        seen.add(fd.name)
        for dep in sorted(fd.dependencies, key=lambda d: d.name):
            visit(dep)
        fdp = descriptor_pb2.FileDescriptorProto()
        fd.CopyToProto(fdp)
        sort_dependencies(fdp)
        out.append(fdp)

    for name in roots:
        visit(pool.FindFileByName(name))
    return out


def main():
    out_path = sys.argv[1] if len(sys.argv) > 1 else DEFAULT_OUT

    # 1. The services files; importing the transports also registers every proto-plus file.
    built = [build_services_file(*spec) for spec in SERVICE_FILES]
    method_count = sum(b[1] for b in built)
    missing_rules = [m for b in built for m in b[2]]

    # 2. Everything the services files import, plus the fixed extras, from the default pool.
    pool = descriptor_pool.Default()
    roots = EXTRA_FILES + [d for b in built for d in b[0].dependency]
    files = ordered_files(pool, roots)
    files.extend(b[0] for b in built)

    # 3. Check the set stands on its own: a fresh pool must accept it file by file.
    check = descriptor_pool.DescriptorPool()
    for fdp in files:
        check.Add(fdp)
    services = [
        service
        for fdp in files
        for service in check.FindFileByName(fdp.name).services_by_name.values()
    ]
    total_methods = sum(len(service.methods) for service in services)

    # 4. Write it deterministically.
    fds = descriptor_pb2.FileDescriptorSet(file=files)
    data = fds.SerializeToString(deterministic=True)
    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    with open(out_path, "wb") as f:
        f.write(data)

    names = ", ".join(service.full_name for service in services)
    print(
        f"{os.path.relpath(out_path, ROOT)}: {len(data)} bytes, {len(files)} files, "
        f"{len(services)} services ({names}), {total_methods} methods "
        f"({method_count} of the SDK's transports)"
        + (f"; no http rule: {', '.join(missing_rules)}" if missing_rules else "")
    )


if __name__ == "__main__":
    main()
