// The backend conformance checks (conformance_test.cc) as a piece two
// programs share: the ctest binary device_conformance_test (gtest_main; the
// backends come from TUTTI_CONFORMANCE_BACKENDS or the ones built here) and
// the installed tool tutti-conformance (conformance_main.cc; one plugin named
// on its command line). The checks are GoogleTest tests of the parameterised
// suite "Conformance", one instance per backend.
#pragma once

#include <string>
#include <vector>

namespace tutti::conformance {

// Replaces the backend list; call before testing::InitGoogleTest (the suite's
// instances are made there).
void setBackends(std::vector<std::string> namesOrPaths);

}  // namespace tutti::conformance
