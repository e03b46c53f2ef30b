// sys/exs.h compiles as C++ and its declarations are usable from C++.
#include <sys/exs.h>

int main() {
    exs_event_t ev = exs_event_t();
    exs_qhandle_t q = EXS_QHANDLE_INVALID;
    exs_mhandle_t m = EXS_MHANDLE_UNREGISTERED;
    exs_ahandle_t a = reinterpret_cast<exs_ahandle_t>(-1);
    int (*send)(int, const void *, size_t, int, exs_qhandle_t, exs_ahandle_t, exs_mhandle_t) = exs_send;
    (void)ev;
    (void)send;
    return q == -1 && m == -2 && a != nullptr ? 0 : 1;
}
