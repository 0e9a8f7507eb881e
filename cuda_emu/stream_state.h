// The emulator's stream object (internal to cuda_emu: runtime.cpp and graph.cpp). Work runs when it is queued,
// so a stream only carries its capture state (graph.h).
#pragma once

struct CUgraph_st;

struct CUstream_st {
  CUgraph_st* capture = nullptr;     // the graph being captured into; null: not capturing
  bool capture_invalidated = false;  // a call illegal during capture was made: EndCapture fails
};
