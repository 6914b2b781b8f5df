from django.http import HttpResponse


def home(request):
    return HttpResponse("The host site's own home page.")
