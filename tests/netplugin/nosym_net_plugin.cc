// A shared library that looks like a network plugin by name
// (libnccl-net-nosym.so) but exports no ncclNetPlugin_v* table: for testing
// the loader's error message.
extern "C" __attribute__((visibility("default"))) int tsockNoPluginHere(void) { return 42; }
