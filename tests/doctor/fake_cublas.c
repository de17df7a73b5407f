/*
 * fake_cublas.c - a stand-in cuBLAS of another major (12.4.0) for `tandem
 * doctor` (doctor_test.py fake_driver): built as libcublas.so in a folder of
 * its own and found first through LD_LIBRARY_PATH. It has only what the
 * doctor's probe reads.
 */
int cublasGetProperty(int type, int *value);

int cublasGetProperty(int type, int *value)
{
    /* libraryPropertyType: MAJOR_VERSION 0, MINOR_VERSION 1, PATCH_LEVEL 2 */
    static const int version[3] = {12, 4, 0};
    if (type < 0 || type > 2 || !value)
        return 7; /* CUBLAS_STATUS_INVALID_VALUE */
    *value = version[type];
    return 0;
}
