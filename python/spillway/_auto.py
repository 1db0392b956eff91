"""manage:auto: an unchanged script's models go into chunks (docs/python.md,
"Zero code changes").

Note [Adopting models without being told]: with SPILLWAY_CONF set and
manage:auto (its default), the start-up hook calls
install() before any user code runs. From then on:

- Every module that registers a parameter, a buffer or a submodule is
  remembered, and so is each submodule's parent (torch's global registration
  hooks; weak references only, so nothing is kept alive). So is a module
  rebuilt by unpickling (torch.load of a whole module) or copy.deepcopy,
  which registers nothing: Module.__setstate__ is wrapped. A module's root is
  found by walking up its parents.
- A root is adopted at the first forward of any module in it, or when an
  optimizer receives one of its parameters (Optimizer.add_param_group, which
  every torch optimizer's constructor calls), whichever comes first. Adopting
  is spillway.manage(root): every parameter and buffer of the tree, frozen
  ones included, as they are at that moment. What .to(), .half(),
  .double() or `param.data = ...` did before is therefore already there;
  set_data on a managed parameter later goes into its chunk at the call
  (Note [set_data on a managed parameter, at the call],
  hooks/torch/set_data_hook.cc).
  One root is one chunk-manager client, named after its class.
- A parameter an optimizer receives that no module owns is adopted on its
  own, in a client named after the optimizer's class.
- What spillway cannot manage yet is refused with an error that names the
  module and the way out (manage:explicit), raised from the forward or the
  optimizer's constructor: a module compiled by torch.compile, FSDP's
  flattened or sharded parameters, and DDP with gradient_as_bucket_view.
- A root with a lazy parameter (nn.LazyLinear before its first forward) is
  adopted once the parameter has its shape: at the next forward after.
- The forward hook is installed only while some recorded module's root is
  not adopted yet: a global forward hook sends every module call through
  torch's slow path (bench/python/auto_hook_overhead.py), so once all roots
  are adopted, training runs without it, and a module recorded later
  installs it again.

Modules first called under torch.compile or torch.jit are not seen by the
forward hook; they are refused at their optimizer's construction.
"""

import threading
import weakref

import torch
from torch.nn.modules import module as _torch_module
from torch.nn.parameter import is_lazy


class Refused(RuntimeError):
    """A model spillway cannot manage yet, under manage:auto."""


_OPT_OUT = ("set manage:explicit in SPILLWAY_CONF to leave this model to torch (and manage "
            "supported models with spillway.manage)")


def _is_compiled(module):
    # torch.compile(model) wraps it in an OptimizedModule; model.compile()
    # keeps the module and sets _compiled_call_impl.
    kind = type(module)
    if kind.__name__ == "OptimizedModule" and kind.__module__.startswith("torch._dynamo"):
        return True
    return getattr(module, "_compiled_call_impl", None) is not None


def _name(module):
    """A module's class, or the class torch.compile wrapped."""
    original = getattr(module, "_orig_mod", None)
    if _is_compiled(module) and isinstance(original, torch.nn.Module):
        return type(original).__name__
    return type(module).__name__


def _refusal(root):
    """Why `root` cannot be managed, or None."""
    for name, module in root.named_modules(remove_duplicate=False):
        where = _name(root) + (f" (its submodule '{name}')" if name else "")
        kind = type(module)
        if _is_compiled(module):
            return (f"{where} is compiled with torch.compile, whose generated code reads "
                    "parameter bytes without the ops spillway fetches them for")
        if kind.__name__ == "FullyShardedDataParallel":
            return f"{where} is FSDP-wrapped, and its flattened parameters are sharded by FSDP"
        if kind.__name__ == "DistributedDataParallel" and getattr(
                module, "gradient_as_bucket_view", False):
            return (f"{where} is DistributedDataParallel with gradient_as_bucket_view=True, "
                    "whose gradients are views of DDP's buckets rather than tensors of their own")
    for name, param in root.named_parameters(remove_duplicate=False):
        if getattr(param, "_is_flat_param", False) or type(param).__name__ == "DTensor":
            return (f"{_name(root)}'s parameter '{name}' is an FSDP flattened or "
                    "sharded parameter")
    return None


class _Adopter:
    def __init__(self, manage):
        self._manage = manage  # spillway.manage-like: (module_or_named, client)
        self._lock = threading.RLock()
        self._parents = weakref.WeakKeyDictionary()  # module -> weakref to its parent
        self._modules = weakref.WeakSet()  # every module that registered something
        self._settled = weakref.WeakSet()  # modules whose root is adopted
        self._deferred = weakref.WeakSet()  # roots waiting for a lazy parameter's shape
        self._handles = []
        self._forward_hook = None  # while some recorded module's root is not adopted
        self._recorded_since_check = False

    def install(self):
        self._handles = [
            _torch_module.register_module_parameter_registration_hook(self._registered),
            _torch_module.register_module_buffer_registration_hook(self._registered),
            _torch_module.register_module_module_registration_hook(self._child_registered),
        ]
        self._watch_forwards()
        original = torch.optim.Optimizer.add_param_group
        adopter = self

        def add_param_group(optimizer, param_group):
            original(optimizer, param_group)
            adopter._adopt_for_optimizer(optimizer, optimizer.param_groups[-1]["params"])

        add_param_group.__wrapped__ = original
        add_param_group.__doc__ = original.__doc__
        torch.optim.Optimizer.add_param_group = add_param_group
        self._handles.append(lambda: setattr(torch.optim.Optimizer, "add_param_group", original))

        # Unpickling (torch.load of a whole module) and copy.deepcopy rebuild
        # a module through __setstate__, with no registration hook.
        setstate = torch.nn.Module.__setstate__

        def module_setstate(module, state):
            setstate(module, state)
            adopter._rebuilt(module)

        module_setstate.__wrapped__ = setstate
        torch.nn.Module.__setstate__ = module_setstate
        self._handles.append(lambda: setattr(torch.nn.Module, "__setstate__", setstate))

    def uninstall(self):
        for handle in self._handles:
            handle.remove() if hasattr(handle, "remove") else handle()
        self._handles = []
        self._unwatch_forwards()

    # Note [Adopting models without being told]: a global forward hook takes
    # torch's slow path in every module call (bench/python/auto_hook_overhead.py),
    # so it is there only while a recorded module's root is not adopted yet.

    def _watch_forwards(self):
        if self._forward_hook is None:
            self._forward_hook = _torch_module.register_module_forward_pre_hook(
                self._before_forward)

    def _unwatch_forwards(self):
        if self._forward_hook is not None:
            self._forward_hook.remove()
            self._forward_hook = None

    def _unwatch_forwards_if_all_adopted(self):
        """After an adoption, or the first forward after a module was recorded."""
        self._recorded_since_check = False
        if all(self._root_of(module) in self._settled for module in list(self._modules)):
            self._unwatch_forwards()

    # Registration: remember modules and their parents.

    def _recorded(self, module):
        self._modules.add(module)
        self._recorded_since_check = True
        self._watch_forwards()

    def _registered(self, module, name, tensor):
        self._recorded(module)
        return None

    def _child_registered(self, module, name, child):
        self._recorded(module)
        if child is not None:
            self._recorded(child)
            self._parents[child] = weakref.ref(module)
        return None

    def _rebuilt(self, module):
        with self._lock:
            self._recorded(module)
            for child in getattr(module, "_modules", {}).values():
                if child is not None:
                    self._child_registered(module, None, child)

    def _root_of(self, module):
        seen = {id(module)}
        while True:
            parent_ref = self._parents.get(module)
            parent = parent_ref() if parent_ref is not None else None
            # A parent that dropped the child (del model.layer) is no parent.
            if parent is None or id(parent) in seen or not any(
                    child is module for child in parent._modules.values()):
                return module
            seen.add(id(parent))
            module = parent

    # Adoption.

    def _before_forward(self, module, args):
        if module in self._settled and not self._recorded_since_check:
            return None
        with self._lock:
            root = self._root_of(module)
            # A root with lazy parameters is adopted at a forward of its own,
            # never in the middle of one.
            if root in self._deferred and module is not root:
                return None
            if self._adopt(root):
                self._settled.add(module)
            else:
                self._deferred.add(root)
            if self._recorded_since_check:
                self._unwatch_forwards_if_all_adopted()
        return None

    def _adopt(self, root):
        """Manages `root` unless it is already; False while it has a lazy
        parameter. Raises Refused."""
        if root in self._settled:
            return True
        why = _refusal(root)
        if why is not None:
            raise Refused(f"spillway (manage:auto) cannot manage {_name(root)}: {why}; "
                          f"{_OPT_OUT}")
        if any(is_lazy(tensor) for tensor in _tensors_of(root)):
            return False
        self._manage(root, type(root).__name__)
        self._settled.add(root)
        self._deferred.discard(root)
        self._unwatch_forwards_if_all_adopted()
        return True

    def _adopt_for_optimizer(self, optimizer, params):
        with self._lock:
            owners = {}  # id(param) -> its root
            roots = set()  # ids
            for module in list(self._modules):
                root = self._root_of(module)
                if id(root) in roots:
                    continue
                roots.add(id(root))
                for param in root.parameters():
                    owners.setdefault(id(param), root)
            wanted = []
            loose = []
            group = len(optimizer.param_groups) - 1
            for index, param in enumerate(params):
                root = owners.get(id(param))
                if root is None:
                    loose.append((f"param_groups.{group}.params.{index}", param))
                elif all(root is not other for other in wanted):
                    wanted.append(root)
            for root in wanted:
                if root in self._settled:
                    # Parameters added since (adapters, say) join in a client
                    # of their own; the managed ones stay where they are.
                    self._manage(root, type(root).__name__)
                else:
                    self._adopt(root)
            if loose:
                self._manage(loose, f"{type(optimizer).__name__}.params")


def _tensors_of(module):
    yield from module.parameters()
    yield from module.buffers()


_adopter = None


def install(manage):
    """Starts adopting models (Note [Adopting models without being told]).
    `manage(module_or_named, client)` puts them into chunks."""
    global _adopter
    if _adopter is None:
        _adopter = _Adopter(manage)
        _adopter.install()


def uninstall():
    """Stops adopting models; what is managed stays managed."""
    global _adopter
    if _adopter is not None:
        _adopter.uninstall()
        _adopter = None
