print('placeholder')
