$˜
•
verifier-1127.0.0.1:7710"demo-target*@abababababababababababababababababababababababababababababababab2@cdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcd8@HXbj9
0.1.0aa359b4*29.0.02
GNU 12.2.0:RelWithDebInfoBcpux€ €ˆ€ ’0123456789abcdef