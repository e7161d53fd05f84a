// rankwise.h included from C++ as it is: the functions keep C linkage (this links).
#include <cstdio>

#include <rankwise.h>

int main() {
    rankwise_sizes sizes;
    rankwise_status st = rankwise_tsqr_svd_query(100, 4, RANKWISE_COL_MAJOR, &sizes);
    std::printf("rankwise %s from C++: status %d, U is %lld x %lld\n", rankwise_version(), static_cast<int>(st),
                static_cast<long long>(sizes.u_rows), static_cast<long long>(sizes.u_cols));
    return st == RANKWISE_OK && sizes.u_cols == 4 ? 0 : 1;
}
