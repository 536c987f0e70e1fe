//===- GradTest.cpp - gradient ops against float64 references -----------===//

#include "KernelTestUtil.h"
