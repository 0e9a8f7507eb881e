// MPI_Comm without <mpi.h>, for headers that only pass a communicator through (process groups, the topology): a
// program that includes them, and the training layer above, then compiles without MPI's include path. This is the
// typedef Open MPI's mpi.h makes, and repeating a typedef of the same type is legal, so a file may include both;
// one that does (every .cpp of dist/ does) fails to compile if the two differ, i.e. against another MPI. Anything
// that calls MPI (or uses MPI_COMM_WORLD, MPI_COMM_NULL) includes <mpi.h> itself.
#pragma once

struct ompi_communicator_t;
typedef struct ompi_communicator_t* MPI_Comm;
