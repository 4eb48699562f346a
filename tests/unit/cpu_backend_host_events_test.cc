// The CPU backend's table (backends/cpu/cpu_backend.h): setDevice and host
// events. Its queues are synchronous, so a host event there is a flag:
// eventQuery answers 0 until hostEventSignal, eventSynchronize blocks until
// another thread signals, and eventWait on an unsignalled host event is
// refused (it could only be honoured by blocking the caller) while on a
// signalled one it does nothing.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>

#include "backends/cpu/cpu_backend.h"

namespace tutti::cpu {
namespace {

const tuttiBackendPlugin_v1& table() { return *backendPlugin(); }

TEST(CpuBackendTable, SetDeviceAcceptsOnlyDeviceZero) {
  ASSERT_NE(table().setDevice, nullptr);
  EXPECT_EQ(table().setDevice(nullptr, 0), ncclSuccess);
  EXPECT_EQ(table().setDevice(nullptr, 1), ncclInvalidArgument);
  EXPECT_NE(std::string(table().lastError(nullptr)).find("no device 1"), std::string::npos)
      << table().lastError(nullptr);
  EXPECT_EQ(table().setDevice(nullptr, -1), ncclInvalidArgument);
}

TEST(CpuBackendTable, HostEventIsAFlag) {
  const auto& t = table();
  ASSERT_NE(t.hostEventCreate, nullptr);
  ASSERT_NE(t.hostEventSignal, nullptr);
  tuttiPluginEvent_t he = nullptr, plain = nullptr;
  EXPECT_EQ(t.hostEventCreate(nullptr, 1, &he), ncclInvalidArgument);
  ASSERT_EQ(t.hostEventCreate(nullptr, 0, &he), ncclSuccess);
  ASSERT_EQ(t.eventCreate(nullptr, 0, &plain), ncclSuccess);
  int32_t done = -1;
  ASSERT_EQ(t.eventQuery(nullptr, he, &done), ncclSuccess);
  EXPECT_EQ(done, 0);
  EXPECT_EQ(t.eventRecord(nullptr, he, nullptr), ncclInvalidArgument);
  EXPECT_EQ(t.eventWait(nullptr, nullptr, he), ncclInvalidArgument);
  EXPECT_NE(std::string(t.lastError(nullptr)).find("synchronous"), std::string::npos)
      << t.lastError(nullptr);
  EXPECT_EQ(t.hostEventSignal(nullptr, plain), ncclInvalidArgument);  // not a host event

  // eventSynchronize returns only once another thread has signalled.
  std::atomic<bool> signalled{false};
  std::thread signaller([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    signalled = true;
    EXPECT_EQ(t.hostEventSignal(nullptr, he), ncclSuccess);
  });
  EXPECT_EQ(t.eventSynchronize(nullptr, he), ncclSuccess);
  EXPECT_TRUE(signalled.load());
  signaller.join();

  EXPECT_EQ(t.hostEventSignal(nullptr, he), ncclSuccess);  // idempotent
  ASSERT_EQ(t.eventQuery(nullptr, he, &done), ncclSuccess);
  EXPECT_EQ(done, 1);
  EXPECT_EQ(t.eventWait(nullptr, nullptr, he), ncclSuccess);  // nothing to wait for
  // Ordinary events are unchanged: complete at once.
  EXPECT_EQ(t.eventRecord(nullptr, plain, nullptr), ncclSuccess);
  EXPECT_EQ(t.eventWait(nullptr, nullptr, plain), ncclSuccess);
  ASSERT_EQ(t.eventQuery(nullptr, plain, &done), ncclSuccess);
  EXPECT_EQ(done, 1);
  EXPECT_EQ(t.eventDestroy(nullptr, he), ncclSuccess);
  EXPECT_EQ(t.eventDestroy(nullptr, plain), ncclSuccess);
}

}  // namespace
}  // namespace tutti::cpu
