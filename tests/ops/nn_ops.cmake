# Neural-network ops (branch ops-fused): embedding, layernorm, gelu, softmax, cross-entropy, attention, dropout.
minidl_add_test(test_nn_ops
  ${CMAKE_CURRENT_LIST_DIR}/test_nn_ops.cpp
  ${CMAKE_CURRENT_LIST_DIR}/test_attention.cpp
  ${CMAKE_CURRENT_LIST_DIR}/test_cpu_exp.cpp
  ${CMAKE_CURRENT_LIST_DIR}/test_dropout.cpp)
