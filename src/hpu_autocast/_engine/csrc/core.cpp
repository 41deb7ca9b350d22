// The C++ core: the engine's kernel on the ops key, for regions that do not observe.
//
// What it does is what the Python kernels do (``_kernels``: ``_apply``, ``_POLICY``; ``_walk``:
// ``cast_inputs``), in the same shape, in C++: one generic *boxed* kernel,
// registered per policy overload on the borrowed ops key, looks the overload up in the region's
// compiled table; its cast policy's function (``kPolicies``) names the target dtype or changes
// the dtype arguments; one walk casts the eligible tensors on the dispatcher's stack, last to
// first, through the region's cast cache (native's rules); then the op is called with the
// engine's keys excluded. docs/design.md
// ("The C++ core") has the long form; this file's Notes say why each piece is as it is.
//
// Which rules the core applies is decided once, in Python (``OpRule.core``, Note: which calls
// the core decides, in _table); ``_core._row`` writes the others as ``kPython``. At each call the
// kernel also hands to the Python kernel (``to_python``) what only Python can see:
//   * no frame set for this thread by ``set_frame`` (an autograd worker thread, a thread that
//     never opened a region), or a frame set in another Python context than the running one
//     (an asyncio task, ``contextvars.Context.run``): Python reads the context's own frame;
//   * the frame's region closed (an exit out of order) or observes (it is never set here then);
//   * a TorchDispatchMode is active (tracing for torch.compile, FLOP counting): the Python
//     kernel installs the compile guard and runs under the mode as before;
//   * a PROMOTE that meets a dtype it cannot promote (its error).
// A call whose region has no rule for the op is passed on below the ops key, as the Python
// kernel passes it on.
//
// [Note: the frame in C++] A region's frame lives in a Python context variable (``_regions``);
// reading it from C++ would take the GIL on every call. Instead ``set_frame`` copies the frame
// the calling context now has into this thread's C++ state, with the context it belongs to (a
// strong reference, so that no other context can later reuse its address). The kernel trusts
// that copy only while the thread runs in that same context: ``PyThreadState.context`` is only
// ever changed by its own thread, so reading it there needs no lock.

#include <torch/extension.h>
#include <torch/library.h>

#include <ATen/autocast_mode.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/InferenceMode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <c10/util/SmallVector.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/csrc/utils/tensor_memoryformats.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace py = pybind11;

namespace hpu_autocast_core {

using c10::DispatchKey;
using c10::DispatchKeySet;
using c10::IValue;
using torch::jit::Stack;

// The cast policies (``CastPolicy``; ``kNone``: no rule; ``kPython``: a rule the core hands to
// the Python kernel, ``OpRule.core``'s Note: which calls the core decides).
enum Action : int8_t {
  kNone = -1, kLower = 0, kFp32 = 1, kSetOptDtype = 2, kAppendDtype = 3, kPromote = 4, kFirst = 5, kPython = 6
};

// What one schema argument is to the rule (``_walk.inputs``): a positional input (a tensor
// or a list of them), a positional argument the op writes (counted, never replaced by a copy,
// not counted by PROMOTE), a keyword-only input (a single tensor), or nothing to look at (a
// keyword argument the op writes, ``out=``: not an input).
enum Kind : int8_t { kPositional = 0, kWritten = 1, kKeyword = 2, kSkip = 3 };

struct Rule {
  Action action = kNone;
  bool input_only = false;      // casts its first tensor alone (Gaudi's norms), on this device
  bool composite = false;       // decomposes above autograd (``_ops.is_composite``)
  bool leave_explicit = false;  // a call passing a dtype runs unchanged (``OpRule.leave_explicit``)
  std::vector<int8_t> kinds;    // per schema argument
  std::vector<int> dtype_args;  // ``OpRule.dtype_args``: the dtype arguments the rule reads
  std::optional<c10::OperatorHandle> redispatch;  // FP32_APPEND_DTYPE's overload with a dtype
};

// A compiled policy for one device type: rules by op index (``Kernel::index``).
struct Table {
  std::vector<Rule> rules;
};

// The cast cache (``_cast_cache.cached_cast``'s Note): native's entries, keyed by the tensor and
// the dtype, valid while the tensor lives. The Python path of a region reaches it through
// ``cast`` (with the GIL); kernels in other threads may too, hence the lock.
struct Cache {
  struct Key {
    const c10::TensorImpl* impl;
    at::ScalarType dtype;
    bool operator==(const Key& o) const { return impl == o.impl && dtype == o.dtype; }
  };
  struct Hash {
    size_t operator()(const Key& k) const {
      return std::hash<const void*>()(k.impl) ^ (static_cast<size_t>(k.dtype) << 1);
    }
  };
  struct Entry {
    c10::weak_intrusive_ptr<c10::TensorImpl> source;
    at::Tensor copy;
  };
  std::mutex mu;
  std::unordered_map<Key, Entry, Hash> map;

  // ``t`` (float32, an eligible leaf that requires grad and is no view) cast to ``dtype``: the
  // entry's copy while ``t`` lives, else a fresh copy made with grad on and remembered.
  std::pair<at::Tensor, bool> cast(const at::Tensor& t, at::ScalarType dtype) {
    const Key key{t.unsafeGetTensorImpl(), dtype};
    {
      std::lock_guard<std::mutex> lock(mu);
      auto it = map.find(key);
      if (it != map.end() && !it->second.source.expired() && it->second.source.lock().get() == key.impl) {
        return {it->second.copy, true};
      }
    }
    at::Tensor copy;
    {
      at::AutoGradMode grad(true);  // as native since pytorch#158232: a later use with grad needs it
      copy = t.to(dtype);
    }
    std::lock_guard<std::mutex> lock(mu);
    map.insert_or_assign(key, Entry{c10::weak_intrusive_ptr<c10::TensorImpl>(t.getIntrusivePtr()), copy});
    return {copy, false};
  }

  void clear() {
    std::unordered_map<Key, Entry, Hash> dropped;
    {
      std::lock_guard<std::mutex> lock(mu);
      dropped.swap(map);
    }  // the copies are freed outside the lock
  }

  size_t size() {
    std::lock_guard<std::mutex> lock(mu);
    return map.size();
  }
};

// What the regions of one compiled policy on one device type share (built once, ``_core``).
struct RegionKind {
  std::shared_ptr<const Table> table;
  c10::DeviceType device;
  DispatchKeySet engine_keys;  // the ops key and the observing key: excluded around a call
};

// One open region of ``_regions`` that the core decides for.
struct Region {
  std::shared_ptr<const Table> table;
  c10::DeviceType device;
  std::shared_ptr<Cache> cache;
  DispatchKeySet engine_keys;
  std::atomic<bool> closed{false};
};

// Note [the frame in C++]
struct Frame {
  PyObject* context = nullptr;  // a strong reference
  std::shared_ptr<Region> region;
  at::ScalarType dtype = at::kBFloat16;
  bool enabled = false;
};

thread_local Frame tls_frame;

// How this thread's calls went (``counts``: what the tests check the core decides).
struct Counts {
  uint64_t decided = 0;  // a rule applied here
  uint64_t passed = 0;   // no rule of the region's: passed on below the ops key
  uint64_t handed = 0;   // handed to the Python kernel
};
thread_local Counts tls_counts;

// The native autocast keys whose kernels a composite may have (``_kernels._pass_on``): the
// installed torch's, given by ``set_native_autocast_keys`` (torch 2.4 has no AutocastMPS).
std::vector<DispatchKey> native_autocast;

inline bool in_own_context(const Frame& f) {
  PyThreadState* ts = PyGILState_GetThisThreadState();
  return ts != nullptr && ts->context == f.context;
}

// ``rules.eligibility``: floating, not float64, on the region's device. A wrapped number (the 3
// of ``x / 3``) is a Python number to the Python kernel: never a tensor it looks at.
inline bool looked_at(const at::Tensor& t) {
  return t.defined() && !t.unsafeGetTensorImpl()->is_wrapped_number();
}
inline bool eligible(const at::Tensor& t, c10::DeviceType device) {
  const auto dt = t.scalar_type();
  return at::isFloatingType(dt) && dt != at::kDouble && t.device().type() == device;
}
inline bool reached(const at::Tensor& t, c10::DeviceType device) {
  return at::isFloatingType(t.scalar_type()) && t.device().type() == device;
}

// Calls ``fn(position, tensor)`` for each tensor the rule looks at, in argument order
// (``_walk.inputs``): list items in order; an input-only rule stops at its first tensor.
template <typename Fn>
void for_each_input(const Rule& rule, const IValue* args, size_t n, Fn&& fn) {
  for (size_t i = 0; i < n; ++i) {
    const int8_t kind = rule.kinds[i];
    const IValue& a = args[i];
    if (kind == kPositional || kind == kWritten) {
      if (a.isTensor()) {
        const at::Tensor& t = a.toTensor();
        if (looked_at(t)) {
          fn(i, t);
          if (rule.input_only) return;
        }
      } else if (a.isTensorList()) {
        for (const at::Tensor& t : a.toTensorList().vec()) {
          if (looked_at(t)) fn(i, t);
        }
      } else if (a.isList()) {  // Tensor?[] (index)
        for (const IValue& item : a.toListRef()) {
          if (item.isTensor() && looked_at(item.toTensor())) fn(i, item.toTensor());
        }
      }
    } else if (kind == kKeyword && !rule.input_only && a.isTensor() && looked_at(a.toTensor())) {
      fn(i, a.toTensor());
    }
  }
}

struct Kernel;
void to_python(const Kernel& k, const c10::OperatorHandle& op, DispatchKeySet ks, Stack* stack);

// The kernel registered on the ops key for one overload.
struct Kernel final : c10::OperatorKernel {
  Kernel(size_t index, DispatchKey ops_key, PyObject* python) : index(index), ops_key(ops_key), python(python) {}

  void operator()(const c10::OperatorHandle& op, DispatchKeySet ks, Stack* stack) const {
    const Frame& f = tls_frame;
    if (!f.region || f.region->closed.load(std::memory_order_relaxed) || !in_own_context(f) ||
        c10::impl::TorchDispatchModeTLS::stack_len() > 0) {
      return to_python(*this, op, ks, stack);
    }
    const Table& table = *f.region->table;
    if (!f.enabled || index >= table.rules.size() || table.rules[index].action == kNone) {
      return pass_below(op, ks, stack);  // not this region's op
    }
    const Rule& rule = table.rules[index];
    if (rule.action == kPython) return to_python(*this, op, ks, stack);
    apply(rule, f, op, ks, stack);
  }

  void pass_below(const c10::OperatorHandle& op, DispatchKeySet ks, Stack* stack) const {
    ++tls_counts.passed;
    op.redispatchBoxed(ks & DispatchKeySet(DispatchKeySet::FULL_AFTER, ops_key), stack);
  }

  void apply(const Rule& rule, const Frame& f, const c10::OperatorHandle& op, DispatchKeySet ks, Stack* stack) const;
  void go_on(const Rule& rule, const Region& region, const c10::OperatorHandle& op, DispatchKeySet ks,
             Stack* stack) const;

  size_t index;
  DispatchKey ops_key;
  PyObject* python;  // the Python kernel (a strong reference, kept for the life of the process)
};

// --- one call under a rule: one function per cast policy (``_kernels``' Note: the rule, per
// cast policy), as ATen's ``WrapFunction_::call`` -------------------------------------------------

// One call the kernel decides, as a cast policy's function sees it: it may change the dtype
// arguments on the stack, the overload called, and a dtype to append as its last argument.
struct Call {
  const Rule& rule;
  const Frame& f;
  Stack* stack;
  size_t n;                                // the op's arguments: the top ``n`` of the stack
  const c10::OperatorHandle* op;           // the overload called
  std::optional<at::ScalarType> appended;  // pushed as the last argument before the call

  IValue* args() const { return &*(stack->end() - n); }
  // ATen's ``firstarg_is_eligible``.
  bool first_eligible() const {
    const IValue& a = args()[0];
    return a.isTensor() && a.toTensor().defined() && eligible(a.toTensor(), f.region->device);
  }
};

using Target = std::optional<at::ScalarType>;  // the dtype eligible inputs are cast to; none: none

// Each cast policy's function names the target; false hands the call to Python.
bool lower(Call& c, Target& target) {
  target = c.f.dtype;
  return true;
}

bool fp32(Call&, Target& target) {
  target = at::kFloat;
  return true;
}

// ATen's ``set_opt_dtype``: an unset dtype argument becomes float32 if the first is eligible.
bool set_opt_dtype(Call& c, Target&) {
  if (!c.first_eligible()) return true;
  for (int i : c.rule.dtype_args) {
    if (c.args()[i].isNone()) c.args()[i] = IValue(static_cast<int64_t>(at::kFloat));
  }
  return true;
}

// ATen's ``type_from_firstarg``, appended to the call of the overload that takes a dtype.
bool append_dtype(Call& c, Target&) {
  c.appended = c.first_eligible() ? at::kFloat : c.args()[0].toTensor().scalar_type();
  c.op = &*c.rule.redispatch;
  return true;
}

// PROMOTE's and FIRST's dtype (``_kernels._decided`` and ``rules.compute_dtype``); false when
// PROMOTE meets a dtype it cannot promote (the Python kernel then raises its error).
bool decided(Call& c, Target& out) {
  const c10::DeviceType device = c.f.region->device;
  const Rule& rule = c.rule;
  bool ok = true;
  for_each_input(rule, c.args(), c.n, [&](size_t i, const at::Tensor& t) {
    if (!ok || !eligible(t, device)) return;
    if (rule.action == kFirst) {
      if (!out) out = t.scalar_type();
      return;
    }
    if (rule.kinds[i] == kWritten) return;  // PROMOTE: what the op writes is not an input
    const auto d = t.scalar_type();
    if (out == at::kFloat || d == at::kFloat) {
      out = at::kFloat;
    } else if (d == c.f.dtype) {
      out = c.f.dtype;
    } else {
      ok = false;
    }
  });
  return ok;
}

using Policy = bool (*)(Call&, Target&);
// By ``Action``: lower, fp32, fp32_set_opt_dtype, fp32_append_dtype, promote, first.
constexpr Policy kPolicies[] = {lower, fp32, set_opt_dtype, append_dtype, decided, decided};

// --- the one walk over the arguments ------------------------------------------------------------

// What the walk casts to, and through which cache.
struct Caster {
  Target target;
  bool lower;
  Cache* cache;
  c10::DeviceType device;
  size_t count = 0;  // eligible tensors seen

  // ``t`` cast if eligible (through the cache where native's rule allows); ``cast`` says whether it was.
  at::Tensor operator()(const at::Tensor& t, bool castable, bool& cast) {
    if (!looked_at(t) || !eligible(t, device)) return t;
    ++count;
    if (!castable || !target || t.scalar_type() == *target) return t;
    cast = true;
    if (cache != nullptr && lower && t.scalar_type() == at::kFloat && t.requires_grad() && t.is_leaf() &&
        !t.is_view() && !c10::InferenceMode::is_enabled()) {
      return cache->cast(t, *target).first;
    }
    return t.to(*target);
  }
};

// One argument's eligible tensors cast in place (a list's items in order).
void cast_argument(IValue& a, bool castable, Caster& caster) {
  bool cast = false;
  if (a.isTensor()) {
    at::Tensor t = caster(a.toTensor(), castable, cast);
    if (cast) a = std::move(t);
  } else if (a.isTensorList()) {
    std::vector<at::Tensor> items = a.toTensorList().vec();
    for (auto& t : items) t = caster(t, castable, cast);
    if (cast) a = IValue(c10::List<at::Tensor>(items));
  } else if (a.isList()) {  // Tensor?[] (index)
    c10::List<std::optional<at::Tensor>> items;
    items.reserve(a.toListRef().size());
    for (const IValue& item : a.toListRef()) {
      items.push_back(item.isTensor() ? std::optional<at::Tensor>(caster(item.toTensor(), castable, cast))
                                      : std::nullopt);
    }
    if (cast) a = IValue(items);
  }
}

// The walk: the eligible inputs cast to the target, last argument to first (Note [the order of
// casts] in _kernels); returns how many were eligible.
size_t cast_inputs(const Call& c, const Target& target, Cache* cache) {
  IValue* args = c.args();
  c10::SmallVector<int, 8> positions;  // on the stack: this runs for every cast op
  for_each_input(c.rule, args, c.n, [&](size_t i, const at::Tensor&) {
    if (positions.empty() || positions.back() != static_cast<int>(i)) positions.push_back(static_cast<int>(i));
  });
  Caster caster{target, target == c.f.dtype, cache, c.f.region->device};
  for (auto it = positions.rbegin(); it != positions.rend(); ++it) {
    cast_argument(args[*it], c.rule.kinds[*it] != kWritten, caster);
  }
  return caster.count;
}

bool explicit_dtype(const Rule& rule, const IValue* args) {
  for (int i : rule.dtype_args) {
    if (!args[i].isNone()) return true;
  }
  return false;
}

void Kernel::apply(const Rule& rule, const Frame& f, const c10::OperatorHandle& op, DispatchKeySet ks,
                   Stack* stack) const {
  ++tls_counts.decided;
  const Region& region = *f.region;
  Call c{rule, f, stack, op.schema().arguments().size(), &op, std::nullopt};
  if (rule.leave_explicit && explicit_dtype(rule, c.args())) {  // seed 003: its insides are its own
    c10::impl::ExcludeDispatchKeyGuard guard(region.engine_keys);
    return op.callBoxed(stack);
  }
  Target target;
  if (!kPolicies[rule.action](c, target)) {
    --tls_counts.decided;
    return to_python(*this, op, ks, stack);
  }
  Cache* cache = at::autocast::is_autocast_cache_enabled() ? region.cache.get() : nullptr;
  {
    c10::impl::ExcludeDispatchKeyGuard guard(region.engine_keys);
    bool go = cast_inputs(c, target, cache) > 0;
    if (!go) {
      for_each_input(rule, c.args(), c.n, [&](size_t, const at::Tensor& t) { go = go || reached(t, region.device); });
    }
    if (go) {
      if (c.appended) stack->emplace_back(static_cast<int64_t>(*c.appended));
      return c.op->callBoxed(stack);
    }
  }
  go_on(rule, region, op, ks, stack);
}

// No floating tensor of the region's device: on as if the engine were not there
// (``_kernels._pass_on``): a composite decomposes (below the ops key), unless a native autocast
// key is on; any other op runs with the engine's keys excluded.
void Kernel::go_on(const Rule& rule, const Region& region, const c10::OperatorHandle& op, DispatchKeySet ks,
                   Stack* stack) const {
  bool natives_off = true;
  for (DispatchKey k : native_autocast) {
    if (!region.engine_keys.has(k) && !c10::impl::tls_is_dispatch_key_excluded(k)) natives_off = false;
  }
  if (rule.composite && natives_off) {
    return op.redispatchBoxed(ks & DispatchKeySet(DispatchKeySet::FULL_AFTER, ops_key), stack);
  }
  c10::impl::ExcludeDispatchKeyGuard guard(region.engine_keys);
  op.callBoxed(stack);
}

// --- the hand-off to the Python kernel --------------------------------------------------------
// As torch's own PythonKernelHolder: arguments to Python (positional ones, less trailing
// defaults; keyword-only ones not at their default, by name), the result back to IValues.
py::object argument_to_py(const c10::Argument& arg, const IValue& v) {
  if (v.isNone()) return py::none();
  auto match = [&](c10::TypeKind kind) {
    const auto& t = arg.real_type();
    if (t->kind() == kind) return true;
    if (auto opt = t->cast<c10::OptionalType>()) return opt->getElementType()->kind() == kind;
    return false;
  };
  if (match(c10::ScalarTypeType::Kind)) {
    return py::reinterpret_borrow<py::object>(
        reinterpret_cast<PyObject*>(torch::getTHPDtype(static_cast<at::ScalarType>(v.toInt()))));
  }
  if (match(c10::LayoutType::Kind)) {
    return py::reinterpret_borrow<py::object>(
        reinterpret_cast<PyObject*>(torch::getTHPLayout(static_cast<at::Layout>(v.toInt()))));
  }
  if (match(c10::MemoryFormatType::Kind)) {
    return py::reinterpret_borrow<py::object>(
        torch::utils::getTHPMemoryFormat(static_cast<at::MemoryFormat>(v.toInt())));
  }
  return torch::jit::toPyObject(v);
}

void to_python(const Kernel& k, const c10::OperatorHandle& op, DispatchKeySet ks, Stack* stack) {
  const auto& schema = op.schema();
  const size_t n = schema.arguments().size();
  ++tls_counts.handed;
  std::vector<IValue> arguments = torch::jit::pop(*stack, n);
  py::gil_scoped_acquire gil;
  auto is_default = [&](size_t i) {
    const auto& d = schema.arguments()[i].default_value();
    return d.has_value() && *d == arguments[i];
  };
  size_t keyword_start = n;
  while (keyword_start > 0 && schema.arguments()[keyword_start - 1].kwarg_only()) --keyword_start;
  size_t positional_end = keyword_start;
  while (positional_end > 0 && is_default(positional_end - 1)) --positional_end;
  py::tuple args(positional_end + 1);
  args[0] = py::cast(ks);
  for (size_t i = 0; i < positional_end; ++i) args[i + 1] = argument_to_py(schema.arguments()[i], arguments[i]);
  py::dict kwargs;
  for (size_t i = keyword_start; i < n; ++i) {
    if (!is_default(i)) kwargs[py::str(schema.arguments()[i].name())] = argument_to_py(schema.arguments()[i], arguments[i]);
  }
  PyObject* out = PyObject_Call(k.python, args.ptr(), kwargs.ptr());
  if (out == nullptr) throw python_error();
  py::object result = py::reinterpret_steal<py::object>(out);
  const auto& returns = schema.returns();
  if (returns.size() == 1) {
    torch::jit::push(stack, torch::jit::toIValue(result, returns[0].real_type()));
  } else if (returns.size() > 1) {
    auto outs = py::cast<py::sequence>(result);
    for (size_t i = 0; i < returns.size(); ++i) {
      torch::jit::push(stack, torch::jit::toIValue(outs[i], returns[i].real_type()));
    }
  }
}

// --- registration and the region state, from Python --------------------------------------------
// Kept for the life of the process and never destroyed: at exit, static destructors run in no
// set order across libraries, and a registration outliving the dispatcher must not be undone.
auto& libraries = *new std::vector<std::unique_ptr<torch::Library>>();
auto& op_index = *new std::unordered_map<std::string, size_t>();  // "ns::name.overload" -> Kernel::index

size_t register_kernel(const std::string& ns, const std::string& name, const std::string& overload,
                       DispatchKey key, py::object python) {
  const std::string qualified = ns + "::" + name + "." + overload;
  auto found = op_index.find(qualified);
  if (found != op_index.end()) return found->second;
  const size_t index = op_index.size();
  auto lib = std::make_unique<torch::Library>(torch::Library::IMPL, ns, key, __FILE__, __LINE__);
  lib->impl((overload.empty() ? name : name + "." + overload).c_str(),
            torch::CppFunction::makeFromBoxedFunctor(
                std::make_unique<Kernel>(index, key, python.release().ptr())));
  libraries.push_back(std::move(lib));
  op_index.emplace(qualified, index);
  return index;
}

// One rule from its row, a ``_core.CoreRule`` (a NamedTuple): each field read once, by its name.
Rule make_rule(const py::handle& row) {
  Rule rule;
  rule.action = static_cast<Action>(row.attr("action").cast<int>());
  rule.input_only = row.attr("input_only").cast<bool>();
  rule.composite = row.attr("composite").cast<bool>();
  rule.kinds = row.attr("kinds").cast<std::vector<int8_t>>();
  rule.dtype_args = row.attr("dtype_args").cast<std::vector<int>>();
  rule.leave_explicit = row.attr("leave_explicit").cast<bool>();
  const auto redispatch = row.attr("redispatch").cast<std::pair<std::string, std::string>>();
  if (!redispatch.first.empty()) {
    rule.redispatch = c10::Dispatcher::singleton().findSchemaOrThrow(redispatch.first.c_str(), redispatch.second.c_str());
  }
  return rule;
}

// A table from its rows (``_core.CoreRule``s), each at its op's index.
std::shared_ptr<Table> make_table(const py::list& rows) {
  auto table = std::make_shared<Table>();
  for (const auto& row : rows) {
    const size_t index = row.attr("index").cast<size_t>();
    if (table->rules.size() <= index) table->rules.resize(index + 1);
    table->rules[index] = make_rule(row);
  }
  return table;
}

void set_frame(std::shared_ptr<Region> region, bool enabled, at::ScalarType dtype) {
  PyObject* context = PyThreadState_Get()->context;
  Py_XINCREF(context);
  Frame& f = tls_frame;
  PyObject* was = f.context;
  f.context = context;
  f.region = std::move(region);
  f.enabled = enabled;
  f.dtype = dtype;
  Py_XDECREF(was);
}

void clear_frame() {
  Frame& f = tls_frame;
  PyObject* was = f.context;
  f.context = nullptr;
  f.region.reset();
  Py_XDECREF(was);
}

// --- the module, in three parts --------------------------------------------------------------

void bind_types(py::module_& m) {
  py::class_<Table, std::shared_ptr<Table>>(m, "Table");
  py::class_<Cache, std::shared_ptr<Cache>>(m, "Cache")
      .def(py::init<>())
      .def("cast", &Cache::cast, py::call_guard<py::gil_scoped_release>())
      .def("clear", &Cache::clear)
      .def("__len__", &Cache::size);
  py::class_<Region, std::shared_ptr<Region>>(m, "Region")
      .def("close", [](Region& r) { r.closed.store(true); });
  py::class_<RegionKind, std::shared_ptr<RegionKind>>(m, "RegionKind")
      .def(py::init([](std::shared_ptr<Table> table, const std::string& device, DispatchKey ops_key,
                       DispatchKey all_key) {
        auto k = std::make_shared<RegionKind>();
        k->table = std::move(table);
        k->device = c10::Device(device).type();
        k->engine_keys = DispatchKeySet(ops_key) | DispatchKeySet(all_key);
        return k;
      }))
      .def("open", [](const RegionKind& k, std::shared_ptr<Cache> cache) {
        auto r = std::make_shared<Region>();
        r->table = k.table;
        r->device = k.device;
        r->engine_keys = k.engine_keys;
        r->cache = std::move(cache);
        return r;
      }, "A region of this kind, casting through ``cache``");
}

void bind_functions(py::module_& m) {
  m.def("register_kernel", &register_kernel);
  m.def("set_native_autocast_keys", [](std::vector<DispatchKey> keys) { native_autocast = std::move(keys); });
  m.def("make_table", &make_table);
  m.def("set_frame", &set_frame);
  m.def("clear_frame", &clear_frame);
  m.def("counts", []() {
    const Counts& c = tls_counts;
    return py::dict(py::arg("decided") = c.decided, py::arg("passed") = c.passed, py::arg("handed") = c.handed);
  }, "How the calling thread's calls on the ops key went: decided by the core, passed on, handed to Python");
}

// The codes ``_core._row`` writes: each cast policy by ``CastPolicy``'s member name, and each argument kind.
void bind_codes(py::module_& m) {
  m.def("action_codes", []() {
    return py::dict(py::arg("LOWER") = static_cast<int>(kLower), py::arg("FP32") = static_cast<int>(kFp32),
                    py::arg("FP32_SET_OPT_DTYPE") = static_cast<int>(kSetOptDtype),
                    py::arg("FP32_APPEND_DTYPE") = static_cast<int>(kAppendDtype),
                    py::arg("PROMOTE") = static_cast<int>(kPromote), py::arg("FIRST") = static_cast<int>(kFirst),
                    py::arg("PYTHON") = static_cast<int>(kPython));
  });
  m.def("kind_codes", []() {
    return py::dict(py::arg("positional") = static_cast<int>(kPositional), py::arg("written") = static_cast<int>(kWritten),
                    py::arg("keyword") = static_cast<int>(kKeyword), py::arg("skip") = static_cast<int>(kSkip));
  });
}

}  // namespace hpu_autocast_core

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "hpu_autocast's C++ core: the ops key's kernel for regions that do not observe";
  hpu_autocast_core::bind_types(m);
  hpu_autocast_core::bind_functions(m);
  hpu_autocast_core::bind_codes(m);
}
