
Hello